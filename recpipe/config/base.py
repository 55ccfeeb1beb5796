"""Shared pydantic base classes for the pipeline config.

Every section forbids unknown keys: a misspelt field is an error naming its dotted path,
never silently ignored (EasyRec's protobuf text format behaves the same way).
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, model_validator


class Section(BaseModel):
    """A config section: unknown keys are errors, values are validated on assignment. The
    string under each field is its description (the config reference is rendered from them,
    ``recpipe.config.reference``, which reads them from the source: pydantic's
    ``use_attribute_docstrings`` would parse every class's source at each import, a third of
    the time an Airflow task process spends parsing the DAG file)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, frozen=False)


class OneOf(Section):
    """A protobuf-style ``oneof``: exactly one of the declared fields must be set.

    EasyRec writes ``optimizer_config { adam_optimizer { ... } }``; the YAML form is
    ``optimizer_config: [{adam_optimizer: {...}}]``. ``which()`` returns the chosen name.
    """

    # fields beside the oneof (protobuf's fields outside its ``oneof`` block)
    _beside: ClassVar[frozenset[str]] = frozenset()

    @classmethod
    def options(cls) -> list[str]:
        """The oneof's field names."""
        return [n for n in cls.model_fields if n not in cls._beside]

    @model_validator(mode="after")
    def _exactly_one(self) -> OneOf:
        chosen = [name for name in self.options() if getattr(self, name) is not None]
        if len(chosen) != 1:
            raise ValueError(f"set exactly one of: {', '.join(self.options())} (got {chosen or 'none'})")
        return self

    def which(self) -> str:
        """Name of the field that is set."""
        return next(n for n in self.options() if getattr(self, n) is not None)

    def value(self) -> Any:
        """The value of the field that is set."""
        return getattr(self, self.which())
