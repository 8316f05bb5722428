"""Configuration: serving.properties + OPTION_* environment -> one validated ServingConfig."""
