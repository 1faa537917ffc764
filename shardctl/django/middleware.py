"""``MIDDLEWARE = ["shardctl.django.ShardMiddleware", ...]``: every request starts on no shard and
leaves none behind, whatever its view did (an ``on_shard`` block left open by a generator, an
exception): the context variable is reset when the response (or the exception) leaves. A view that
raised ``ShardMoved`` (its transaction met a shard that had moved; the Router now routes it to the new
host) answers 503 with ``Retry-After: 0``: the client's next try is routed right. A view decorated
with ``shardctl.django.retry_on_move`` runs again itself instead."""

from __future__ import annotations

from typing import Any

from asgiref.sync import iscoroutinefunction, markcoroutinefunction

from ..errors import ShardMoved
from .context import _current


class ShardMiddleware:
    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Any):
        self.get_response = get_response
        if iscoroutinefunction(get_response):
            markcoroutinefunction(self)

    def __call__(self, request: Any) -> Any:
        if iscoroutinefunction(self):
            return self._acall(request)
        token = _current.set(None)
        try:
            return self.get_response(request)
        finally:
            _current.reset(token)

    async def _acall(self, request: Any) -> Any:
        token = _current.set(None)
        try:
            return await self.get_response(request)
        finally:
            _current.reset(token)

    def process_exception(self, request: Any, exception: Exception) -> Any:
        if not isinstance(exception, ShardMoved):
            return None
        from django.http import HttpResponse

        return HttpResponse(
            f"{exception}\n", status=503, content_type="text/plain", headers={"Retry-After": "0"}
        )
