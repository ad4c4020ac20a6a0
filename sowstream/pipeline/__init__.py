"""The Spark data pipeline: jobs over the transaction log, and the content-filter language
compiled to Spark Column expressions.

Importing this package does not import pyspark; the modules that need it import it themselves.
"""
