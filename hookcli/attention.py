"""``SwapsAttention``: a torch function mode that also replaces F.scaled_dot_product_attention.

A torch function mode sees the calls a model makes itself, but not those made inside
another torch function that a mode handles (the mode is off while its handler runs):
``F.multi_head_attention_forward`` calls SDPA so. A mode that must see every SDPA call
(cost's kernel choice on meta, ``--amp`` on meta) therefore also puts a function of its
own in place of ``torch.nn.functional.scaled_dot_product_attention`` while it is on.
"""

from __future__ import annotations

from typing import Any

import torch


class SwapsAttention:
    """Mixin, listed before the mode class in the bases: while the mode is on,
    ``F.scaled_dot_product_attention`` is ``self._attention``; ``self._replaced`` is the
    function that was there when the mode was entered (another mode's, or torch's), put
    back when it ends, also when entering fails."""

    _replaced: Any = None

    def _attention(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError

    def __enter__(self) -> Any:
        functional = torch.nn.functional
        self._replaced = functional.scaled_dot_product_attention
        functional.scaled_dot_product_attention = self._attention
        try:
            super().__enter__()  # type: ignore[misc]
        except BaseException:
            functional.scaled_dot_product_attention = self._replaced
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            super().__exit__(*exc)  # type: ignore[misc]
        finally:
            torch.nn.functional.scaled_dot_product_attention = self._replaced
