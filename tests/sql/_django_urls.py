"""A Django URLconf with one fenced view, for tests/sql/test_http_truth.py (its database is
``TRUTH_DB_URL``, read per request: the test sets it)."""

from __future__ import annotations

import os
from typing import Any

import sqlalchemy as sa
from django.http import JsonResponse
from django.urls import path
from sqlalchemy.orm import Session

from idemkey import current_call
from idemkey.contrib.sqlalchemy import fenced

CHARGES = sa.table("charges", sa.column("key"), sa.column("fence"), sa.column("worker"))


def charges(request: Any) -> JsonResponse:
    engine = sa.create_engine(os.environ["TRUTH_DB_URL"])
    try:
        call = current_call()
        with Session(engine) as session, session.begin():
            session.execute(sa.insert(CHARGES).values(key="django", fence=call.fence))
            fenced(session, call)
    finally:
        engine.dispose()
    return JsonResponse({"charge": "django"}, status=201)


urlpatterns = [path("charges", charges)]
