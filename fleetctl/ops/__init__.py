"""Operations on hosts, each facts -> pure plan -> apply, results as data (the CLI renders):
deploy, rollback, launch/stop/status (launch.py), verify (verify-logs), discover, rolling."""
