"""A code location holding two analyses, as a team's project would (``AI_PIPELINE_DEFINITIONS``):
the built-in document analysis under the plain names, then the contract review under its own
prefix. Each has its own results database (a SQLite file of its own under ``DAGSTER_HOME``)."""

from ai_pipeline.defs.factory import build_definitions
from ai_pipeline.defs.site import Site

LOCATION = "ai_pipeline_tests.service.two_analyses:defs"
ANALYSES = ("document_analysis", "contract_review")

defs = build_definitions(
    [Site(analysis="document_analysis"), Site(analysis="contract_review", prefix="contract_review")]
)
