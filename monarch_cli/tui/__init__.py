"""`monarch dashboard`: the reservation live in a Textual app (imported only by that command)."""
