#!/bin/sh
# redis-server with the password of the secret $1 (/run/secrets/$1, or under
# $RECPIPE_SECRETS_DIR), quoted as redis.conf quotes a string, and any further arguments as
# config lines, all on its stdin: neither the compose file, nor the container's environment,
# nor `ps` shows the password.
set -eu
password=$(sed 's/[\\"]/\\&/g' "${RECPIPE_SECRETS_DIR:-/run/secrets}/$1")
shift
{
  printf 'requirepass "%s"\n' "$password"
  for line in "$@"; do printf '%s\n' "$line"; done
} | exec redis-server -
