"""Write the generated pages of the site: the CLI reference and one page per conversion rule.

mkdocs-gen-files runs this script at every ``mkdocs build`` (``plugins: gen-files`` in ``mkdocs.yml``) and adds
the files it writes to the site as if they were in ``docs/``; none of them is in the repository. They are made
from the code, so they cannot fall behind it: ``reference/cli.md`` from the argparse parsers of ``dpmigrate``,
``dpmigrate verify`` and ``dpmigrate launch``, ``rules/index.md`` and ``rules/<framework>/<rule>.md`` from the
rule registry and each rule's docstring. The logic lives in ``dpmigrate.reporting.docs_pages`` (tested by
``tests/test_docs_site.py``); it imports no framework, so the site builds without torch, TensorFlow or Paddle.
"""

import mkdocs_gen_files

from dpmigrate.reporting.docs_pages import pages

for path, text in pages().items():
    with mkdocs_gen_files.open(path, "w") as page:
        page.write(text)
