from __future__ import annotations

from django import forms
from django.core.exceptions import ValidationError

from .models import validate_repo_id


class TrackForm(forms.Form):
    repo_id = forms.CharField(
        label="Hub model id",
        max_length=300,
        help_text="owner/name, as in huggingface.co/owner/name (e.g. Qwen/Qwen3-0.6B)",
        widget=forms.TextInput(attrs={"placeholder": "Qwen/Qwen3-0.6B", "autocomplete": "off"}),
    )

    def clean_repo_id(self) -> str:
        try:
            return validate_repo_id(self.cleaned_data["repo_id"])
        except ValidationError as err:
            raise ValidationError(err.messages[0]) from None
