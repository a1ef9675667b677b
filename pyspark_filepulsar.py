"""Top-level module Spark discovers for format("filepulsar")."""
