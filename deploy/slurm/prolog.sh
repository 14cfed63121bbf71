#!/bin/sh
# gpuwatt's Slurm prolog: tells the collector which job each allocated GPU works for.
#
# For every GPU of the job it writes <job dir>/<GPU index or uuid> holding the job id; the
# collector's job_mapping_dir reads it (collector/jobs.py: MappingDirResolver), so a GPU counts
# for its job from allocation on, before the job starts a process. epilog.sh removes the files.
#
# Install on every GPU node (root:root, 0755) and name it in slurm.conf:
#     Prolog=/etc/slurm/gpuwatt-prolog.sh
#     Epilog=/etc/slurm/gpuwatt-epilog.sh
#     PrologFlags=Alloc      # run at allocation, not at the first step
# (or call both from the prolog/epilog you already have). Runs as SlurmdUser (root).
#
# Which GPUs: SLURM_JOB_GPUS (the node's GPU indexes, set for the prolog and epilog), else
# SLURM_STEP_GPUS, else CUDA_VISIBLE_DEVICES (indexes, or GPU-/MIG- uuids). Anything else in
# those lists (a MIG path, "NoDevFiles", a name with a slash) is skipped.
# A monitoring hook must never drain a node: this script always exits 0 and logs what it skipped.
PATH=/usr/sbin:/usr/bin:/sbin:/bin
export PATH
umask 022
set -f # no globbing of the values read from the environment

job_dir="${GPUWATT_JOB_DIR:-/run/gpuwatt/jobs}"
job_id="${SLURM_JOB_ID:-}"
gpus="${SLURM_JOB_GPUS:-${SLURM_STEP_GPUS:-${CUDA_VISIBLE_DEVICES:-}}}"

# To the system log (journal) and to stderr (slurmd's log, at its debug levels).
say() {
	printf 'gpuwatt-prolog: %s\n' "$*" >&2
	logger -t gpuwatt-prolog -- "$*" 2>/dev/null || :
}

case "$job_id" in
'' | *[!0-9]*)
	say "SLURM_JOB_ID '${job_id}' is not a job id; nothing written"
	exit 0
	;;
esac
[ -n "$gpus" ] || exit 0 # a job without GPUs on this node

if ! mkdir -p "$job_dir" 2>/dev/null; then
	say "cannot create ${job_dir}; job ${job_id} not mapped"
	exit 0
fi
chmod 0755 "$job_dir" 2>/dev/null

old_ifs=$IFS
IFS=,
for gpu in $gpus; do
	IFS=$old_ifs
	case "$gpu" in
	'' | *[!0-9A-Za-z-]* | -*)
		say "skipping GPU '${gpu}' of job ${job_id}: not an index or a uuid"
		continue
		;;
	*[!0-9]*)
		case "$gpu" in
		GPU-* | MIG-*) ;;
		*)
			say "skipping GPU '${gpu}' of job ${job_id}: not an index or a uuid"
			continue
			;;
		esac
		;;
	esac
	# Written beside the target and renamed over it: the collector never reads half a file.
	tmp=$(mktemp "${job_dir}/.${gpu}.XXXXXX" 2>/dev/null) || {
		say "cannot write in ${job_dir}; GPU ${gpu} of job ${job_id} not mapped"
		continue
	}
	if printf '%s\n' "$job_id" >"$tmp" && chmod 0644 "$tmp" && mv -f "$tmp" "${job_dir}/${gpu}"; then
		:
	else
		rm -f "$tmp"
		say "cannot write ${job_dir}/${gpu} for job ${job_id}"
	fi
done
exit 0
