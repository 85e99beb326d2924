from lab.engine_parsers import main

main()
