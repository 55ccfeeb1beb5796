"""Shared pydantic base classes for the pipeline config.

Every section forbids unknown keys: a misspelt field is an error naming its dotted path,
never silently ignored (EasyRec's protobuf text format behaves the same way).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, model_validator


class Section(BaseModel):
    """A config section: unknown keys are errors, values are validated on assignment. The
    string under each field is its description (the config reference is rendered from them,
    ``recpipe.config.reference``)."""

    model_config = ConfigDict(
        extra="forbid", validate_assignment=True, frozen=False, use_attribute_docstrings=True
    )


class OneOf(Section):
    """A protobuf-style ``oneof``: exactly one of the declared fields must be set.

    EasyRec writes ``optimizer_config { adam_optimizer { ... } }``; the YAML form is
    ``optimizer_config: [{adam_optimizer: {...}}]``. ``which()`` returns the chosen name.
    """

    @model_validator(mode="after")
    def _exactly_one(self) -> OneOf:
        chosen = [name for name in type(self).model_fields if getattr(self, name) is not None]
        if len(chosen) != 1:
            options = ", ".join(type(self).model_fields)
            raise ValueError(f"set exactly one of: {options} (got {chosen or 'none'})")
        return self

    def which(self) -> str:
        """Name of the field that is set."""
        return next(n for n in type(self).model_fields if getattr(self, n) is not None)

    def value(self) -> Any:
        """The value of the field that is set."""
        return getattr(self, self.which())
