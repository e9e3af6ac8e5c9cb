from __future__ import annotations

from django.urls import path

from . import views

urlpatterns = [
    path("health", views.health),
    path("reasoned", views.reasoned),
    path("charges", views.charges),
    path("charges/<int:charge_id>", views.capture),
    path("charges/<int:charge_id>/refund", views.refund),
    path("async-charges", views.async_charges),
    path("login", views.login),
    path("webhook", views.webhook),
    path("slow", views.slow),
    path("forms", views.forms),
    path("forms-by-request-id", views.forms_by_request_id),
]
