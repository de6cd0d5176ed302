"""AccaSim (PyPI ``accasim``) on the same cleaned trace as corral's simulator: the
validation's other arm, for tests/test_simulate.py and bench/simulate.py.

Both read the jobs corral's SWF reader keeps (``swf_jobs``), written back as SWF with
the runtime and limit it decided, on a machine of ``cores`` one-core nodes; AccaSim
maps each processor to a one-core request (its default equivalence), so both see one
pool of cores. Start times come from AccaSim's own job objects as they complete.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import time
from contextlib import redirect_stdout
from io import StringIO
from pathlib import Path
from typing import Any

from corral.simulate.cluster import one_pool
from corral.simulate.workload import SimJob, swf_jobs


def write_clean_swf(path: Path, out: Path, max_jobs: int | None = None) -> tuple[list[SimJob], int]:
    """(the jobs kept, the machine's cores) of trace ``path``, written to ``out`` as SWF."""
    from corral.simulate.workload import scan_swf

    cores = scan_swf(path).max_procs
    jobs: list[SimJob] = []
    with out.open("w") as f:
        f.write(f"; MaxProcs: {cores}\n")
        for j in swf_jobs(path, one_pool(cores)):
            if max_jobs is not None and len(jobs) >= max_jobs:
                break
            jobs.append(j)
            f.write(f"{j.id} {int(j.submit)} -1 {int(j.run)} {j.cores} -1 -1 {j.cores} {int(j.limit)} -1 1 "
                    f"{j.user} 1 -1 1 0 -1 -1\n")
    return jobs, cores


def run_accasim(swf: Path, cores: int, algorithm: str) -> tuple[dict[int, float], float]:
    """({job id: start time}, seconds AccaSim took) for 'fcfs' or 'easy'."""
    import collections
    import collections.abc

    # AccaSim 1.1.3 (2021) imports Mapping from collections, which Python 3.10 removed.
    collections.Mapping = collections.abc.Mapping  # type: ignore[attr-defined]
    from accasim.base.additional_data import AdditionalData
    from accasim.base.allocator_class import FirstFit
    from accasim.base.scheduler_class import EASYBackfilling, FirstInFirstOut
    from accasim.base.simulator_class import Simulator

    starts: dict[int, float] = {}

    class Starts(AdditionalData):  # type: ignore[misc]
        def exec_before_dispatching(self, job_dict: Any, queued_jobs: Any) -> None: ...
        def exec_after_dispatching(self, job_dict: Any, to_dispatch_jobs: Any, rejected_jobs: Any) -> None: ...
        def exec_before_submission(self, *args: Any, **kwargs: Any) -> None: ...
        def exec_after_submission(self, *args: Any, **kwargs: Any) -> None: ...
        def exec_before_completion(self, *args: Any, **kwargs: Any) -> None: ...
        def stop(self) -> None: ...

        def exec_after_completion(self, removed_jobs: Any) -> None:
            for j in removed_jobs:
                starts[int(j.id)] = float(j.start_time)

    logging.getLogger("accasim").setLevel(logging.ERROR)
    logging.getLogger().setLevel(logging.WARNING)
    with tempfile.TemporaryDirectory() as d:
        cfg = Path(d) / "sys.json"
        cfg.write_text(json.dumps({"groups": {"g": {"core": 1}}, "resources": {"g": cores}}))
        alloc = FirstFit()
        disp = FirstInFirstOut(alloc) if algorithm == "fcfs" else EASYBackfilling(alloc)
        cwd = os.getcwd()
        os.chdir(d)  # AccaSim writes its results folder under the working directory
        try:
            with redirect_stdout(StringIO()):
                sim = Simulator(str(swf), str(cfg), disp, additional_data=[Starts], scheduling_output=False,
                                statistics_output=False, show_statistics=False, RESULTS_FOLDER_NAME=d)
                t0 = time.perf_counter()
                sim.start_simulation(system_status=False)
                took = time.perf_counter() - t0
        finally:
            os.chdir(cwd)
    return starts, took
