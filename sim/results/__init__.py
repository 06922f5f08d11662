"""What a run leaves: the result object, summary.json, time series, ITLs, plots, the timeline
export and the HTML report."""
