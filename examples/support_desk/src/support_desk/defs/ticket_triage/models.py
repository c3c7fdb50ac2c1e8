"""What the support desk wants of every ticket."""

from typing import Literal

from pydantic import BaseModel, Field


class Ticket(BaseModel):
    queue: Literal["billing", "shipping", "account", "other"] = Field(
        description="Which team takes the ticket."
    )
    urgent: bool = Field(description="The customer cannot work or is losing money now.")
    reason: str = Field(max_length=200, description="What the customer needs, in one sentence.")
    customer: str | None = Field(description="The customer's name as written, if given.")
    quotes: list[str] = Field(description="Passages of the ticket, exactly as written.")
    confidence: float = Field(ge=0, le=1, description="How sure the triage is, 0 to 1.")
