#!/usr/bin/env bash
# Fails on a tracked file over 1 MB or a tracked executable binary (ELF,
# Mach-O, PE): build outputs belong in ignored folders (bin/, dist/, the lab
# cache), never in every clone.
set -euo pipefail
cd "$(dirname "$0")/../.."
limit=$((1024 * 1024))
status=0
while IFS= read -r -d '' f; do
  [ -f "$f" ] || continue # deleted in the work tree, not yet committed
  size=$(stat -c %s "$f")
  if [ "$size" -gt "$limit" ]; then
    echo "tracked file over 1 MB: $f ($size bytes); build it, don't commit it"
    status=1
  fi
  case "$(head -c 4 "$f" | od -An -tx1 | tr -d ' \n')" in
  7f454c46 | cffaedfe | cefaedfe | feedface | feedfacf | 4d5a*)
    echo "tracked executable binary: $f; git rm --cached it and ignore it"
    status=1
    ;;
  esac
done < <(git ls-files -z)
exit "$status"
