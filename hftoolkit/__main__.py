from hftoolkit.cli import main

main()
