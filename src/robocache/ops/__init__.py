"""Public functional API: one module per op family (validate -> dispatch -> return)."""
