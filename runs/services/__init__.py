"""Services are the only writers of run state; views, the API, tasks and commands import the module
that does the job (``runs.services.lifecycle``, ``.effects``, ``.records``...): nothing is re-exported
here."""
