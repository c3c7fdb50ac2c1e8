"""The one ``Definitions`` of the product's own code location (what ``workspace.yaml`` loads): the
analysis the deployment names (``AI_PIPELINE_ANALYSIS``), under the plain names.

A project of its own holds its analyses as components instead (``ai_pipeline.component``); both
are built by ``ai_pipeline.defs.factory``.
"""

from ai_pipeline.defs.factory import build_definitions
from ai_pipeline.defs.site import DEFAULT_SITE

defs = build_definitions([DEFAULT_SITE])
