"""The bodies the submission service answers, and the statuses every operation may answer, as its
OpenAPI document shows them. The routes that answer them are ``app``'s.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from ai_pipeline.service.progress import TaskStatus


class Submitted(BaseModel):
    task_id: str
    analysis: str = Field(description="the analysis the task is for (named, or the default)")
    status: TaskStatus = Field(description="QUEUED for a new task: accepted, waiting for a run")
    poll_url: str = Field(description="the task's URL (from the service's public URL, else a path)")
    sse_url: str = Field(description="its event stream's URL")
    estimated_seconds: int


class Sections(BaseModel):
    done: int
    total: int


class ReviewOutcome(BaseModel):
    decision: str = Field(description="`rejected`: a person reviewed the task and turned it down")
    decided_by: str = Field(description="`person`: a reviewer decided, not the pipeline")
    decided_at: str
    message: str = Field(description="the standard message to the submitter")
    message_en: str


class Task(BaseModel):
    task_id: str
    analysis: str = Field(description="the analysis the task is for")
    name: str
    status: TaskStatus
    cancel_requested: bool
    progress: int = Field(ge=0, le=100)
    current_step: str
    sections: Sections
    result: dict[str, Any] | None
    category: str | None
    error: str | None = Field(
        description="why the task failed; after a reviewer's rejection, the standard message"
    )
    review: ReviewOutcome | None = Field(description="a reviewer's decision, once there is one")
    created_at: str
    completed_at: str | None
    dagster_run_url: str | None


class TaskPage(BaseModel):
    tasks: list[Task]
    total: int
    limit: int
    offset: int


class AnalysisList(BaseModel):
    analyses: list[str] = Field(description="the analyses a submission may name (`analysis`)")
    default: str = Field(description="the one a submission that names none goes to")


class Problem(BaseModel):
    detail: str | list[dict[str, Any]] = Field(description="what is wrong, for a person")


def problem(description: str, **headers: str) -> dict[str, Any]:
    answer: dict[str, Any] = {"model": Problem, "description": description}
    if headers:
        answer["headers"] = {
            name: {"description": why, "schema": {"type": "string"}}
            for name, why in headers.items()
        }
    return answer


# What any call of the API may answer besides its own outcomes.
CALLER: dict[int | str, dict[str, Any]] = {
    401: problem(
        "no valid API key: `Authorization: Bearer <key>`",
        **{"WWW-Authenticate": "Bearer"},
    ),
    403: problem("X-Tenant-Id names another tenant than the key's"),
    422: problem("a parameter or the body is not what this operation takes"),
    429: problem(
        "over the tenant's requests per minute",
        **{"Retry-After": "seconds to the next clock minute"},
    ),
}
NO_TASK: dict[int | str, dict[str, Any]] = {
    404: problem("no such task of this tenant (another tenant's answers the same)")
}
