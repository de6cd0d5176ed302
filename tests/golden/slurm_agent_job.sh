#!/bin/bash
#SBATCH --job-name=corral-17
#SBATCH --comment='corral_job=17 principal=claude-1 kind=agent sponsor=alice session=sess-9 nonce=-'
#SBATCH --output=/jobs/17/out/stdout
#SBATCH --error=/jobs/17/out/stderr
#SBATCH --open-mode=append
#SBATCH --nodes=1
#SBATCH --ntasks=1
#SBATCH --cpus-per-task=4
#SBATCH --mem=8192M
#SBATCH --time=00:02:00
#SBATCH --partition=gpu
#SBATCH --gres=gpu:2
#SBATCH --account=physics
#SBATCH --nice=100
#SBATCH --qos=agents

corral_run=${SLURM_RESTART_COUNT:-0}
if [ "$corral_run" -gt 0 ]; then rm -f /jobs/17/out/ended; m="corral: Slurm requeued this job (restart $corral_run); it runs again from the start, and the output above this line is from an earlier run that did not finish"; echo "$m"; echo "$m" >&2; fi
printf -v corral_now "%(%s)T" -1; echo "$corral_now $corral_run ${SLURMD_NODENAME:-$(hostname)}" > /jobs/17/out/started

export CORRAL_JOB_ID=17
export CORRAL_PRINCIPAL=claude-1
export CORRAL_SESSION=sess-9
export SEED=42
export MSG='it'"'"'s ok'
(
python train.py --epochs 3
) &
w=$!
_fwd() { corral_trapped=1; kill -s "$1" $w 2>/dev/null; }
for s in HUP INT QUIT USR1 USR2 CONT TSTP; do trap "_fwd $s" $s; done
while :; do corral_trapped=; wait $w; rc=$?; kill -0 $w 2>/dev/null && continue
  if [ -n "$corral_trapped" ] && [ "$rc" -gt 128 ]; then wait $w; corral_rc=$?; [ "$corral_rc" = 127 ] || rc=$corral_rc; fi; break; done
echo "$rc $corral_run" > /jobs/17/out/ended
exit $rc
