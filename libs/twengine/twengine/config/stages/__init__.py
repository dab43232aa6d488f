"""The stages `twengine.config.build` runs, one module per stage: reading one field
(`fields`), the top sections (`sections`), the providers (`providers`), aliases, groups and
routes (`routing`), and the checks across sections (`consistency`). Internal: the public door
is `twengine.config`."""

__all__ = ()
