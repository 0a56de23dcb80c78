"""The OpenAI-compatible URLs, mounted at /v1/ by pokosite/urls.py."""

from django.urls import path

from inference.openai_api import views

urlpatterns = [
    path("chat/completions", views.chat_completions, name="openai-chat-completions"),
    path("models", views.models, name="openai-models"),
]
