#!/bin/sh
# The worker API's key of a front door (modelfleet.plan.router): made once on the router host, never sent anywhere.
# Arguments: KEY_FILE (the key, for the launcher) HEADER_FILE (the header curl sends to the worker API).
# Both are 0600 from creation (umask) and renamed into place; an existing pair is kept (the router runs with it).
key_file=$1 header_file=$2
umask 077
if [ -s "$key_file" ] && [ -s "$header_file" ]; then exit 0; fi
dir=$(dirname "$key_file")
tmp_key=$(mktemp "$dir/.modelfleet-admin.XXXXXX") || exit 1
tmp_header=$(mktemp "$dir/.modelfleet-admin.XXXXXX") || { rm -f "$tmp_key"; exit 1; }
key=$(od -An -N32 -tx1 /dev/urandom | tr -d ' \n')
if [ ${#key} -ne 64 ]; then rm -f "$tmp_key" "$tmp_header"; echo "modelfleet: no random bytes for $key_file" >&2; exit 1; fi
printf '%s\n' "$key" > "$tmp_key" && printf 'Authorization: Bearer %s\n' "$key" > "$tmp_header" &&
  mv "$tmp_key" "$key_file" && mv "$tmp_header" "$header_file"
