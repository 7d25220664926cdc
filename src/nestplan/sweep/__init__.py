"""Many plans at once: a TOML spec expanded into cases, solved on local processes or a Ray
cluster, results kept in one SQLite file and summarised as a table, CSV and plots."""
