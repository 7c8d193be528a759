"""The paper's experiments as functions over the simulator: fig1, table1, fig3, table2, fig4b, all."""
