"""Archives as pack sources: a tar (plain or compressed, or on standard input) or a zip, read in
one sequential pass and never extracted (see ``source``)."""
