"""Task worlds: prompts, parsers, generators and data loaders."""
