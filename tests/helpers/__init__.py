"""What the tests share: runners, doubles, listeners, PEM material, recorded samples, recipe pools."""
