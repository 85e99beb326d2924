#!/bin/sh
# What a stage has already put on a host, for modelfleet.host.facts.state.DeployedState. Arguments are KIND=VALUE
# (path, unit, image, tree, package, text, owned, user, reboot); each answer starts with a "$MARK KIND VALUE" line.
# Set by the caller: MARK, MANIFEST, FETCH_LOCK, PARTIAL, CURRENT, OWNED_MARK, unit_show (systemctl show for unit
# "$1"), package_state (the OS family's installed version of package "$1"), and reboot_needed where the family
# answers that by a program (exit 0: the host needs a reboot).
for arg; do
  kind=${arg%%=*}
  value=${arg#*=}
  echo "$MARK $kind $value"
  case $kind in
  path)
    if [ -d "$value" ]; then
      stat -c "dir %a %U %G -" -- "$value"
      # A directory's first entries by name: whether modelfleet may take it over (operations.files).
      echo entries
      # shellcheck disable=SC2012 # names one a line, as ls sorts them; a stage reads only whether any is foreign
      LC_ALL=C ls -A -- "$value" | head -n 64 | sed "s/^/entry /"
    elif [ -f "$value" ]; then
      echo "file $(stat -c "%a %U %G" -- "$value") $(sha256sum < "$value" | cut -c1-64)"
    fi ;;
  unit)
    s=$(unit_show "$value" 2>/dev/null)
    echo "$s"
    # Each drop-in's text, so a stage can tell what it changes (one systemctl call per unit).
    for d in $(echo "$s" | sed -n "s/^DropInPaths=//p"); do
      echo "$MARK dropin $value $d"
      [ -f "$d" ] && sed "s/^/= /" -- "$d"
    done ;;
  image)
    docker image inspect --format "id={{.Id}}" -- "$value" 2>/dev/null ;;
  tree)
    parent=$(dirname "$value")
    p=$value
    while [ ! -e "$p" ]; do p=$(dirname "$p"); done
    echo "free $(df -B1 -P "$p" | awk 'NR==2 {print $4}')"
    # Never through a link: an engine cache's directory is written by its container too
    [ -f "$value/$MANIFEST" ] && [ ! -L "$value/$MANIFEST" ] && echo "manifest $(tr -d '\n' < "$value/$MANIFEST")"
    # huggingface_hub keeps its own .cache inside a download directory: not part of the tree (an engine cache
    # directory lies under another .cache, so the pattern is anchored at the tree)
    [ -d "$value" ] && find "$value" -type f ! -path "$value/.cache/*" \( -name "*$PARTIAL" -printf "partial %s %P\n" \
      -o ! -name ".modelfleet-*" -printf "file %s %T@ %P\n" \)
    # huggingface_hub's own partial files there (a download that died or froze): no later download resumes them
    [ -d "$value/.cache/huggingface" ] && find "$value/.cache/huggingface" -type f -name "*.incomplete" \
      -printf "partial %s .cache/huggingface/%P\n"
    # What no cache may hold (a symlink, a device, a pipe or socket, a setuid or setgid file): named, never indexed
    [ -d "$value" ] && find "$value" ! -path "$value/.cache/*" \( ! -type f ! -type d -o -type f -perm /6000 \) \
      -printf "odd %y %P\n"
    echo "current $(readlink "$parent/$CURRENT")"
    # shellcheck disable=SC2010,SC2012 # commit directories: 40 hex digits, newest first
    echo "revisions $(ls -t "$parent" 2>/dev/null | grep -Ex "[0-9a-f]{40}" | tr "\n" " ")"
    # A fetch holds its destination's lock while it runs: partial files and unmanifested revision directories
    # without one are left over from a fetch that died (or a host that restarted).
    # shellcheck disable=SC2010
    for r in $(ls "$parent" 2>/dev/null | grep -Ex "[0-9a-f]{40}"); do
      d="$parent/$r"
      if [ -f "$d/$FETCH_LOCK" ] && ! flock -n "$d/$FETCH_LOCK" true 2>/dev/null; then
        echo "busy $r"
        continue
      fi
      [ -f "$d/$MANIFEST" ] || echo "unfinished $r"
    done ;;
  package)
    # Installed packages only ("ii VERSION"); a hold shows as "hi VERSION" (the OS family's query).
    package_state "$value" ;;
  reboot)
    # The OS family's answer (needs-restarting -r on the RHEL family); a missing tool answers no.
    reboot_needed && echo needed ;;
  user)
    # A system user's uid (nothing when there is none).
    getent passwd "$value" | cut -d: -f3 ;;
  text)
    [ -f "$value" ] && sed 's/^/= /' -- "$value" ;;
  owned)
    # The unit files of that directory that modelfleet wrote: named modelfleet-*.service and starting with its
    # mark; a unit someone else wrote under a similar name is never listed (so never retired).
    for f in "$value"/modelfleet-*.service; do
      [ -f "$f" ] && [ "$(head -n 1 -- "$f")" = "$OWNED_MARK" ] || continue
      echo "unit ${f##*/}"
      unit_show "${f##*/}" 2>/dev/null
      sed 's/^/= /' -- "$f"
    done ;;
  esac
done
true
