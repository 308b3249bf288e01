from npa.cli.main import run

run()
