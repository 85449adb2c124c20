def main(args):
    return {"greeting": "Hello " + args.get("name", "stranger") + "!"}
