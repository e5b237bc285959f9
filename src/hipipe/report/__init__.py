"""Reports: terminal tables, Gantt charts and plots (PNG), JSON for machines."""
