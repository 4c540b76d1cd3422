"""Built-in scheduling plugins, one module each; `registry.register_builtin_plugins` lists them."""
