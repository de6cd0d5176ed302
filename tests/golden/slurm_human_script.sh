#!/bin/bash
#SBATCH --job-name=corral-18
#SBATCH --comment='corral_job=18 principal=alice kind=human sponsor=- session=- nonce=-'
#SBATCH --output=/jobs/18/out/stdout
#SBATCH --error=/jobs/18/out/stderr
#SBATCH --open-mode=append
#SBATCH --nodes=1
#SBATCH --ntasks=1
#SBATCH --cpus-per-task=1
#SBATCH --mem=1024M
#SBATCH --time=01:00:00

corral_run=${SLURM_RESTART_COUNT:-0}
if [ "$corral_run" -gt 0 ]; then rm -f /jobs/18/out/ended; m="corral: Slurm requeued this job (restart $corral_run); it runs again from the start, and the output above this line is from an earlier run that did not finish"; echo "$m"; echo "$m" >&2; fi
printf -v corral_now "%(%s)T" -1; echo "$corral_now $corral_run ${SLURMD_NODENAME:-$(hostname)}" > /jobs/18/out/started

export CORRAL_JOB_ID=18
export CORRAL_PRINCIPAL=alice
export CORRAL_SESSION=''
/jobs/18/out/script &
w=$!
_fwd() { corral_trapped=1; kill -s "$1" $w 2>/dev/null; }
for s in HUP INT QUIT USR1 USR2 CONT TSTP; do trap "_fwd $s" $s; done
while :; do corral_trapped=; wait $w; rc=$?; kill -0 $w 2>/dev/null && continue
  if [ -n "$corral_trapped" ] && [ "$rc" -gt 128 ]; then wait $w; corral_rc=$?; [ "$corral_rc" = 127 ] || rc=$corral_rc; fi; break; done
echo "$rc $corral_run" > /jobs/18/out/ended
exit $rc
