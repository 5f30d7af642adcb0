"""The test suite: a package, so that tests import their shared helpers by name (``tests.helpers``)."""
