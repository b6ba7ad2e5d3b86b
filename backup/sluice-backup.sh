#!/usr/bin/env bash
# Hot backup of Sluice's SQLite database, for cron or the systemd timer beside this file.
# The gateway keeps serving: `sluice backup` runs VACUUM INTO (a consistent snapshot),
# writes the file with mode 0600, checks its integrity and keeps the newest [backup] keep.
#
#   SLUICE_CONFIG=/etc/sluice/sluice.toml BACKUP_DIR=/var/backups/sluice backup/sluice-backup.sh
#
# crontab (daily at 03:17):
#   17 3 * * * SLUICE_CONFIG=/etc/sluice/sluice.toml /opt/sluice/backup/sluice-backup.sh >>/var/log/sluice-backup.log 2>&1
set -euo pipefail
: "${SLUICE_CONFIG:=/etc/sluice/sluice.toml}"
: "${SLUICE_BIN:=sluice}"
args=(--config "$SLUICE_CONFIG" backup)
[ -n "${BACKUP_DIR:-}" ] && args+=(--to "$BACKUP_DIR")
umask 077
exec "$SLUICE_BIN" "${args[@]}"
