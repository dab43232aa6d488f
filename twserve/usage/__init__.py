"""Cost and key limits around twengine's pricing and limits."""
