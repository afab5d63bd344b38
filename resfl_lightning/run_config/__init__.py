"""The whole run's config, above the plug-ins it names: the schema (schema.py: RunConfig, whose `algorithm` and
`dataset` are the plug-ins' own classes), the rules across its sections (rules.py), the one entry `load_config`
(load.py), groups named by value (group_names.py) and the tuned files applied before Hydra composes (tuned.py).
How a key is declared, and the sections the plug-ins share, are the kernel's (resfl_lightning/config/)."""
