from hftoolkit.cli.app import main

main()
