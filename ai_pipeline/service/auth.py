"""Who is calling: the tenant whose API key a request carries (401 without a valid one), checked
against ``X-Tenant-Id`` (403) and against the tenant's requests per minute (429), counted in the
results database so that the limit holds however many web processes serve.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Annotated

from fastapi import Depends, Header, HTTPException, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from ai_pipeline.service.tenants import Tenant, Tenants
from ai_pipeline.store import Store

bearer = HTTPBearer(
    auto_error=False,
    scheme_name="tenant_key",
    description="a tenant's API key from the tenants file: `Authorization: Bearer <key>`",
)


def caller(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
    x_tenant_id: Annotated[
        str | None, Header(description="when sent, must be the key's tenant (else 403)")
    ] = None,
) -> Tenant:
    """The tenant a request's key belongs to: 401 without a valid key, 403 when X-Tenant-Id
    names another tenant, 429 over the tenant's per-minute limit."""
    tenants: Tenants = request.app.state.tenants
    tenant = tenants.tenant_of(credentials.credentials.strip()) if credentials else None
    if tenant is None:
        raise HTTPException(
            401,
            "a valid API key is required: Authorization: Bearer <key>",
            headers={"WWW-Authenticate": "Bearer"},
        )
    if x_tenant_id is not None and x_tenant_id != tenant.tenant_id:
        raise HTTPException(403, "X-Tenant-Id does not match the API key's tenant")
    limit = tenant.requests_per_minute
    if limit:
        now = datetime.now(timezone.utc)
        store: Store = request.app.state.store
        if store.tasks.count_request(tenant.tenant_id, now) > limit:
            next_minute = str(60 - now.second)
            raise HTTPException(
                429,
                f"over this tenant's limit of {limit} requests a minute",
                headers={"Retry-After": next_minute},
            )
    return tenant


Caller = Annotated[Tenant, Depends(caller)]
