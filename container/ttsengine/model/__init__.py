"""Pure model code: modules and math, no engine, protocol, handlers or environment."""
