"""What an analysis writes: the HTML report and its charts, the CSV files, the table printed at
the end and the output model repository."""
