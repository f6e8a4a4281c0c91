"""The framework-neutral engine of the codemod.

``engine.convert`` reads a file's bytes, ``detect`` decides which framework it is written for, the
registry (``dpmigrate.frameworks``) gives that framework's rules and vocabulary, and the rules read
one ``index.TreeIndex`` of the original tree through ``query.Query`` and the shared analyses
(``loaders``, ``ranks``, ``entry``), recording edits in one ``plan.Plan`` applied at the end.
Nothing here names a framework's API: that is each framework's ``Vocabulary``.
"""
