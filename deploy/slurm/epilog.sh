#!/bin/sh
# gpuwatt's Slurm epilog: removes the job's files from the job-mapping directory (see prolog.sh).
#
# Every file there that holds this job's id goes, whichever GPU list the epilog is given; a file
# that another job has taken over since (a shared GPU) is left alone. Always exits 0: a
# monitoring hook must never drain a node.
PATH=/usr/sbin:/usr/bin:/sbin:/bin
export PATH
set -f

job_dir="${GPUWATT_JOB_DIR:-/run/gpuwatt/jobs}"
job_id="${SLURM_JOB_ID:-}"

case "$job_id" in
'' | *[!0-9]*) exit 0 ;;
esac
[ -d "$job_dir" ] || exit 0

set +f
for f in "$job_dir"/*; do
	[ -f "$f" ] || continue
	holder=
	read -r holder <"$f" 2>/dev/null
	if [ "$holder" = "$job_id" ]; then
		rm -f "$f"
	fi
done
exit 0
