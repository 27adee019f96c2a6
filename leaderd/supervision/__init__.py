"""Supervision of `leaderd run -- COMMAND`: the child, its keeper, the guard and containment."""
