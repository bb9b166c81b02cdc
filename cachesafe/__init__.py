"""CacheSafe: is a model's chat template safe behind a prompt cache?"""
