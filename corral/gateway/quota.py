"""The caller's remaining budget in one figure each (``quota``): of every limited block of
its token (``Service.budget``: the token, then each it was narrowed from), the least left
of CPU-hours and GPU-hours, of unfinished jobs it may add now, and the tightest submit
rate, each with the block that binds it: what an agent asks before a sweep, not how the
blocks add up (that is ``budget``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field

if TYPE_CHECKING:
    from corral.core.principals import Caller
    from corral.gateway.service import Service


class Quota(BaseModel):
    principal: str
    limited: bool = Field(description="False: the token and those it was narrowed from set no limit.")
    cpu_hours_left: float | None = Field(description="CPU-hours left (a live job reserves its whole walltime); "
                                                     "null: no limit.")
    gpu_hours_left: float | None = Field(description="GPU-hours left; null: no limit.")
    jobs_left: int | None = Field(description="Unfinished jobs you may still add now; null: no limit.")
    submits_per_min: int | None = Field(description="The tightest submission rate; null: no limit.")
    binding: dict[str, str] = Field(description="Figure -> the token block whose limit sets it.")


def quota(service: Service, caller: Caller) -> Quota:
    blocks = service.budget(caller)["budgets"]
    left: dict[str, tuple[Any, str]] = {}

    def least(key: str, value: Any, block: str) -> None:
        if value is not None and (key not in left or value < left[key][0]):
            left[key] = (value, block)

    for b in blocks:
        least("cpu_hours_left", (b.get("cpu_hours") or {}).get("left"), b["block"])
        least("gpu_hours_left", (b.get("gpu_hours") or {}).get("left"), b["block"])
        jobs = b.get("active_jobs")
        least("jobs_left", max(0, jobs["limit"] - jobs["now"]) if jobs else None, b["block"])
        least("submits_per_min", b.get("submits_per_min"), b["block"])
    figures = {k: left.get(k, (None, ""))[0]
               for k in ("cpu_hours_left", "gpu_hours_left", "jobs_left", "submits_per_min")}
    return Quota(principal=caller.name, limited=bool(blocks), binding={k: v[1] for k, v in left.items()},
                 **figures)
