"""The paper's experiments, simulated from measured inputs (settings.py): fig1, table1, fig3, table2, fig4b, moe;
the measured results the report collects (collected.py); provenance of each (provenance.py); ``tabletune report``."""
