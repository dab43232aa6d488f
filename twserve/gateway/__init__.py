"""One request before and after its relay: recognise, authenticate, admit, key turn, row."""
