"""MODEL sources that need an optional extra: ``hf:`` (transformers) and ``timm:``.

Each module has ``build(name, kwargs, seed) -> LoadedModel`` and ``names()``;
``hookcli.loading.PREFIXES`` maps the prefix to it.
"""
