#!/usr/bin/env bash
# Applies the Mooncake integration kit to a Mooncake source tree and points its build at this
# checkout of mooncake-kv-events:
#
#   integrations/mooncake/apply.sh MOONCAKE_DIR
#
# MOONCAKE_DIR holds kvcache-ai/Mooncake at the pinned commit (a checkout, or `git archive` of
# it). The patches in patches/ are applied in order with `git apply` (all or none), then
# MOONCAKE_DIR/extern/mooncake-kv-events is made a symbolic link to this checkout, which
# Mooncake's CMake reads (MOONCAKE_KV_EVENTS_DIR). Running it again on a patched tree only
# refreshes the link. Nothing is written into this checkout.
set -euo pipefail

readonly pinned=3b5a594
here=$(cd "$(dirname "$0")" && pwd)
kit_root=$(cd "$here/../.." && pwd)

die() {
  echo "apply.sh: $*" >&2
  exit 1
}

[ $# -eq 1 ] || die "usage: apply.sh MOONCAKE_DIR"
mooncake=$(cd "$1" 2>/dev/null && pwd) || die "$1 is not a directory"
[ -f "$mooncake/mooncake-store/src/master_service.cpp" ] ||
  die "$mooncake is not a Mooncake source tree (no mooncake-store/src/master_service.cpp)"
command -v git >/dev/null || die "git is needed to apply the patches"

if [ -d "$mooncake/.git" ] || [ -f "$mooncake/.git" ]; then
  head=$(git -C "$mooncake" rev-parse --short=7 HEAD 2>/dev/null || true)
  [ "$head" = "$pinned" ] || [ -z "$head" ] ||
    echo "apply.sh: warning: $mooncake is at $head, the kit is made for $pinned" >&2
fi

patches=("$here"/patches/*.patch)
# git apply works relative to the tree it runs in; the ceiling stops it from treating an
# enclosing repository as the root. Patches of the series touch the same files, so each is
# checked against the tree the ones before it left.
git_apply() {
  (cd "$mooncake" && GIT_CEILING_DIRECTORIES=$(dirname "$mooncake") git apply "$@")
}

if git_apply --reverse --check "${patches[-1]}" 2>/dev/null &&
  ! git_apply --check "${patches[0]}" 2>/dev/null; then
  echo "apply.sh: the patches are already applied to $mooncake"
else
  applied=()
  for patch in "${patches[@]}"; do
    if ! refusal=$(git_apply --check "$patch" 2>&1); then
      for ((i = ${#applied[@]} - 1; i >= 0; i--)); do git_apply --reverse "${applied[i]}"; done
      echo "$refusal" >&2
      die "$(basename "$patch") does not apply to $mooncake (left as it was): the kit is made for Mooncake $pinned"
    fi
    git_apply "$patch"
    applied+=("$patch")
  done
  echo "apply.sh: applied ${#patches[@]} patches to $mooncake"
fi

link="$mooncake/extern/mooncake-kv-events"
if [ -e "$link" ] && [ ! -L "$link" ]; then
  die "$link exists and is not a symbolic link; move it away, or configure Mooncake with -DMOONCAKE_KV_EVENTS_DIR=<this checkout>"
fi
ln -sfn "$kit_root" "$link"
echo "apply.sh: $link -> $kit_root"
