#!/usr/bin/env bash
# `make setup` on a fresh venv: refuses a disk without room for the install, before anything is
# written (a full disk otherwise stops pip midway through its 11 GB).
#   bash scripts/setup_space_check.sh VENV GIB
# Exit 0: room enough (or the free space could not be read: a warning, then the install goes on);
# 1: too little free; 2: GIB is not a whole number.
set -u
venv=$1 need_gib=$2
case $need_gib in
  '' | *[!0-9]*) echo "make setup: SETUP_FREE_GB must be a whole number of GiB, got '$need_gib'" >&2; exit 2 ;;
esac
dir=$venv  # the nearest folder that exists: df needs one, and nothing is created before the check
while [ ! -d "$dir" ]; do dir=$(dirname "$dir"); done
free_kib=$(df -Pk "$dir" 2>/dev/null | awk 'NR == 2 {print $4}')
case $free_kib in
  '' | *[!0-9]*)
    echo "make setup: warning: could not read the free space of $dir (df); installing anyway (about $need_gib GiB)" >&2
    exit 0 ;;
esac
if [ "$free_kib" -lt $((need_gib * 1024 * 1024)) ]; then
  echo "make setup: $((free_kib / 1024 / 1024)) GiB free on the disk of $venv, and the install takes about" \
    "$need_gib GiB: free some space first, or set SETUP_FREE_GB=N to change the limit (nothing was installed)" >&2
  exit 1
fi
