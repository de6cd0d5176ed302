"""Facility notes and the questions they answer: the labeled set of bench/memory.py.

Written for a typical Slurm site (module system, partitions, filesystems, GPUs,
containers, accounting). Each note comes with questions an agent would ask, worded
differently from the note where an agent would: the retrieval has to bridge that.
"""

from __future__ import annotations

# (note, [questions it answers])
NOTES: list[tuple[str, list[str]]] = [
    ("Load CUDA with 'module load cuda/12.2' before importing torch on the gpu partition; without it torch.cuda.is_available() is False.",
     ["torch does not see the GPU", "which cuda module for pytorch"]),
    ("The gpu partition has 4 A100 40GB cards per node; ask with --gpus=1 (gres gpu), never more than 4 per job.",
     ["how many GPUs per node on gpu partition", "what GPU model does the cluster have"]),
    ("The debug partition is limited to 1 hour walltime and 2 nodes; use it for tests, not production runs.",
     ["max walltime on debug", "where to run quick tests"]),
    ("The batch partition allows 2 days walltime; jobs longer than 48 hours must be split with checkpoints.",
     ["longest job allowed on batch partition", "my job needs three days"]),
    ("Home directories have a 20 GB quota; put datasets and checkpoints in /scratch/$USER instead.",
     ["home quota size", "where should I store large datasets"]),
    ("/scratch is purged: files not accessed for 30 days are deleted every Sunday night.",
     ["are scratch files deleted", "scratch purge policy"]),
    ("pip install into /home is slow and eats metadata: create a venv in /scratch/$USER/venvs or use 'module load python/3.11-conda'.",
     ["pip install is very slow", "where to create a python virtual environment"]),
    ("Do not run heavy computation on the login nodes; processes over 10 minutes of CPU there are killed.",
     ["my process on the login node was killed", "can I run training on the login node"]),
    ("MPI jobs: 'module load openmpi/4.1.5' and launch with srun, not mpirun; srun picks up the allocation.",
     ["mpirun does not use all my nodes", "which MPI module to use"]),
    ("Out of memory on the batch partition: the default is 2G per CPU; ask --mem=16G or --mem-per-cpu explicitly.",
     ["default memory per cpu", "job killed for exceeding memory"]),
    ("Apptainer is installed (module load apptainer); Docker is not available on compute nodes.",
     ["can I use docker", "how to run containers"]),
    ("To use a container with GPUs run 'apptainer exec --nv image.sif python train.py'.",
     ["container cannot see gpu", "apptainer gpu flag"]),
    ("The account for the climate project is 'clim-2026'; submit with --account=clim-2026 or jobs are billed to your default.",
     ["which account for climate project", "billing account name"]),
    ("Jobs in the debug QOS may run at most 2 at a time per user; more stay pending with reason QOSMaxJobsPerUserLimit.",
     ["why are my jobs pending QOSMaxJobsPerUserLimit", "how many debug jobs at once"]),
    ("Array jobs: use --array=0-99%10 to run at most 10 tasks at once and be kind to the scheduler.",
     ["how to limit concurrent array tasks", "job array throttle syntax"]),
    ("Conda environments must not live in home: set CONDA_PKGS_DIRS and envs_dirs to /scratch.",
     ["conda fills my home quota", "where do conda environments go"]),
    ("Jupyter on compute nodes: start it inside a job and tunnel with ssh -L; never on the login node.",
     ["how to run jupyter notebook", "jupyter port forwarding"]),
    ("The module for GROMACS is gromacs/2023.3-cuda; the non-cuda build is much slower on gpu nodes.",
     ["which gromacs module", "gromacs gpu build"]),
    ("Python 3.12 is 'module load python/3.12'; the system python3 is 3.9 and lacks most packages.",
     ["system python is too old", "how to get python 3.12"]),
    ("HuggingFace downloads are blocked on compute nodes; download models on the login node into /scratch/$USER/hf and set HF_HOME.",
     ["model download fails on compute node", "where to cache huggingface models"]),
    ("Network access from compute nodes is limited to the package proxy at proxy.hpc:3128 for pip and conda.",
     ["no internet on compute nodes", "pip proxy address"]),
    ("Use sacct -j JOBID --format=JobID,State,ExitCode,MaxRSS,Elapsed to see why a job failed and how much memory it used.",
     ["how to see memory usage of finished job", "find out why job failed"]),
    ("Exit code 137 usually means the job was killed for memory; check MaxRSS in sacct and ask for more.",
     ["exit code 137 meaning", "job exited 137"]),
    ("Segmentation faults in numpy after 'module load intel' come from mixing MKL builds; unload intel or use the conda numpy.",
     ["numpy segfault after loading intel", "segmentation fault numpy mkl"]),
    ("The GPU nodes have 256 GB RAM and 64 cores; ask at most 16 cores per GPU.",
     ["how much ram on gpu nodes", "cpus per gpu ratio"]),
    ("Preemptible jobs: the 'scavenger' partition runs on idle nodes but jobs may be requeued; make them checkpoint.",
     ["is there a free preemptible queue", "what is scavenger partition"]),
    ("Checkpoint long training every 30 minutes to /scratch; jobs hit by node failures are requeued from the start otherwise.",
     ["my job restarted from scratch after node failure", "how often to checkpoint"]),
    ("Interactive sessions: 'srun --pty -p debug -t 30 bash' gives a shell on a compute node for up to 30 minutes.",
     ["how to get an interactive shell", "interactive job command"]),
    ("Tight loops of squeue every second are throttled; use 'corral wait' or sacct once a minute instead.",
     ["squeue rate limited", "polling squeue too often"]),
    ("Large file transfers go through the data transfer node dtn.hpc with rsync or globus, not the login nodes.",
     ["how to transfer big files", "data transfer node name"]),
    ("Project storage /project/<group> is backed up nightly; /scratch is never backed up.",
     ["is scratch backed up", "which filesystem has backups"]),
    ("Many small files hurt Lustre: tar datasets into shards or use the local NVMe /tmp on nodes during jobs.",
     ["dataset with millions of small files is slow", "local disk on compute nodes"]),
    ("Node-local /tmp is 1.6 TB NVMe, wiped at the end of each job; copy results out before the job ends.",
     ["size of node local disk", "tmp files disappear after job"]),
    ("R is 'module load R/4.3.2'; install packages into ~/R/library-4.3 with R_LIBS_USER set.",
     ["which R module", "where to install R packages"]),
    ("Julia depot should be on scratch: export JULIA_DEPOT_PATH=/scratch/$USER/julia.",
     ["julia packages fill home", "julia depot path"]),
    ("Matlab needs the license server: module load matlab/R2024a sets MLM_LICENSE_FILE; it fails on nodes without it.",
     ["matlab license error", "how to load matlab"]),
    ("Jobs requesting more than 64 cores must use the batch partition; debug nodes have only 32.",
     ["how many cores on debug nodes", "job needs 128 cores"]),
    ("The maintenance window is the first Tuesday of each month 08:00-12:00; jobs that would overlap stay pending.",
     ["why is my job pending before maintenance", "when is cluster maintenance"]),
    ("Reason 'ReqNodeNotAvail, Reserved for maintenance' means the job's walltime crosses the maintenance window; shorten it.",
     ["ReqNodeNotAvail reserved for maintenance", "job pending because of reservation"]),
    ("Email notifications: --mail-type=END,FAIL --mail-user=you@uni.edu; do not use ALL for array jobs.",
     ["how to get email when job ends", "mail type options"]),
    ("Set OMP_NUM_THREADS to the value of SLURM_CPUS_PER_TASK or OpenMP programs oversubscribe the node.",
     ["openmp uses too many threads", "set number of threads in job"]),
    ("For multi-GPU training with torchrun use --ntasks-per-node=1 and --gpus-per-node=4, and pass --nproc_per_node=4.",
     ["torchrun multi gpu slurm settings", "distributed training on one node"]),
    ("NCCL timeouts between nodes: set NCCL_SOCKET_IFNAME=ib0 so NCCL uses InfiniBand.",
     ["nccl timeout multi node", "nccl infiniband interface"]),
    ("The storage quota command is 'lfs quota -u $USER /scratch' for scratch and 'quota -s' for home.",
     ["how to check my disk quota", "lfs quota command"]),
    ("Disk quota exceeded on home usually comes from ~/.cache (pip, huggingface); move it with XDG_CACHE_HOME=/scratch/$USER/cache.",
     ["disk quota exceeded in home", "pip cache fills home"]),
    ("Git LFS is available as 'module load git-lfs'; large repos should be cloned to scratch.",
     ["git lfs not found", "where to clone large repository"]),
    ("Job efficiency: 'seff JOBID' shows CPU and memory efficiency after a job ends.",
     ["check job efficiency", "was my job using all cpus"]),
    ("Jobs with --exclusive are billed for the whole node (64 cores) even if they use one.",
     ["exclusive node billing", "does exclusive cost more"]),
    ("The fairshare of an account decays with a 7-day half-life; heavy use this week lowers priority next week.",
     ["why is my priority low", "fairshare half life"]),
    ("Use 'module spider NAME' to find every version of a module and what it needs loaded first.",
     ["how to find available software versions", "module not found in module avail"]),
    ("Tensorflow needs 'module load cudnn/8.9' in addition to cuda; the error is 'Could not load dynamic library libcudnn'.",
     ["libcudnn could not load", "tensorflow gpu module"]),
    ("Spack user installs go to /scratch/$USER/spack; the site spack instance is read-only.",
     ["how to install software with spack", "spack permission denied"]),
]

TOPIC_WORDS = ("job", "node", "partition", "module", "gpu", "memory", "scratch", "quota", "python", "mpi",
               "walltime", "array", "checkpoint", "container", "queue", "account", "license", "cache", "rsync",
               "sacct", "cores", "thread", "dataset", "storage", "priority", "reservation", "environment")


def filler(i: int) -> str:
    """One of many plausible but unrelated notes, to grow the corpus to facility scale."""
    import random

    r = random.Random(i)
    words = r.sample(TOPIC_WORDS, 6)
    return (f"Session {i}: tried {words[0]} settings with {words[1]} {r.randint(1, 512)} and {words[2]}; "
            f"{words[3]} was fine, {words[4]} needed a retry, keep {words[5]} as is (run {r.randint(1000, 99999)}).")


HELDOUT: list[str] = [
    # One more question per note, in NOTES' order, written after every setting of recall
    # (fusion depth, cosine floor, k) was fixed: bench/memory.py reports recall on them
    # apart, as a check on generalization beyond the set those settings were read from.
    "cuda not available in my pytorch job",
    "what kind of graphics cards are on the gpu nodes and how many can I request",
    "is there a short queue for debugging my script",
    "maximum time limit for a normal batch job",
    "I ran out of space in my home directory",
    "my old files in scratch disappeared",
    "best place to put a virtualenv on this cluster",
    "is it ok to compile and run my simulation on the login machine",
    "how should I launch an mpi program",
    "my job got killed because it used too much RAM, how do I request more",
    "how do I run a singularity or docker image here",
    "gpu access from inside a container",
    "what slurm account do I charge the climate work to",
    "only two of my debug jobs run at once, the rest wait",
    "submit a thousand tasks without flooding the queue",
    "anaconda environment location to avoid filling home",
    "open a notebook server on a compute node",
    "molecular dynamics package with gpu support",
    "need a newer python version than the default",
    "cannot download pretrained weights inside a job",
    "how can compute nodes reach pypi",
    "check peak memory and state of a job that already ended",
    "what does it mean when a job exits with 137",
    "numpy crashes with a segfault",
    "how much memory and cpus does a gpu node have",
    "cheap way to use idle nodes if my job can be interrupted",
    "my training restarted from zero after a node crashed",
    "get an interactive shell on a compute node",
    "polling the queue status in a tight loop",
    "copy terabytes of data onto the cluster",
    # (was "which filesystem has backups", word for word a tuning question above: not held out)
    "does anything back up my group's project files",
    "lustre is slow with millions of tiny files",
    "fast local disk on the compute node",
    "install R packages in my user library",
    "julia packages fill my home",
    "matlab fails with a license error",
    "I want to use 128 cores in one job",
    "monthly downtime schedule",
    "pending reason says reserved for maintenance",
    "get an email when my job finishes",
    "openmp program is slow and uses too many threads",
    "distributed pytorch training on four gpus per node",
    "nccl hangs across nodes",
    "how do I check my disk usage limits",
    "pip cache is eating my home quota",
    "cloning a repository with large files tracked by lfs",
    "how efficiently did my job use the cpus and memory it asked for",
    "am I charged for a full node with exclusive",
    "why did my priority drop after a busy week",
    "find all available versions of a software module",
    "tensorflow cannot find libcudnn",
    "where do my own spack builds go",
]


def main() -> None:
    """The labeled set's own check (issue 46: every bench/NAME.py runs in CI): what
    bench/memory.py would measure recall on. A note without a question, or a held-out
    question set out of step with the notes, is recall measured over nothing."""
    import argparse
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from bench._common import finish

    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="(the set is small: the same as a full run)")
    ap.parse_args()
    questions = [q for _, qs in NOTES for q in qs]
    fillers = {filler(i) for i in range(1000)}
    finish("memory_notes", {"bench": "memory_notes", "notes": len(NOTES), "questions": len(questions),
                            "heldout": len(HELDOUT), "distinct_fillers_of_1000": len(fillers)},
           {"notes": bool(NOTES) and all(qs for _, qs in NOTES),
            "questions_distinct": len(set(questions)) == len(questions),
            "heldout": len(HELDOUT) == len(NOTES) and not set(HELDOUT) & set(questions),
            "fillers": len(fillers) == 1000 and fillers.isdisjoint(n for n, _ in NOTES)})


if __name__ == "__main__":
    main()
